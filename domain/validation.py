"""Checks beyond the schema, run by `validate`, `render` and `pulumi preview` alike.

Each check is a pure function from the typed config to problems (stack-file key path, value,
message with the fix), so one run reports everything that is wrong at once.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import math
import re
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

from domain.catalogue.gpu_instances import GpuInstanceType, gpu_instance_types, lookup_instance_type
from domain.catalogue.tuning_profiles import tuning_profiles
from domain.config.errors import Problem
from domain.config.models import SecretRefConfig
from domain.config.platform import PlatformConfig
from domain.versions import VLLM_VERSION

REPO_ROOT = Path(__file__).resolve().parents[1]
QUANTIZATION_METHODS_FILE = REPO_ROOT / "infra" / "data" / f"vllm-{VLLM_VERSION}-quantization-methods.json"
LORA_ARCHITECTURES_FILE = REPO_ROOT / "infra" / "data" / f"vllm-{VLLM_VERSION}-lora-architectures.json"
CONTENT_PART_TYPES_FILE = REPO_ROOT / "infra" / "data" / f"vllm-{VLLM_VERSION}-chat-content-part-types.json"


def ingress_host_problems(config: PlatformConfig) -> list[Problem]:
    """With ingress on, every model needs a hostname: models share one load balancer by host (a
    model that scales to zero has none: to_zero_hostname_problems)."""
    if not config.ingress.enabled or (config.router.enabled and not config.router.per_model_hostnames):
        return []
    return [
        Problem(
            ("models", index, "ingress_host"),
            None,
            "ingress is on but this model has no hostname: set ingress.domain (models get "
            "<name>.<domain>) or models[].ingress_host, or set ingress.enabled: false",
        )
        for index, model in enumerate(config.models)
        if model.ingress_host is None and not model.scales_to_zero
    ]


def load_balancer_source_problems(config: PlatformConfig) -> list[Problem]:
    """Mode `existing` with an ALB: the NetworkPolicies need the ALB's subnets, which only the user knows.
    Mode `eks` computes them from the subnets it creates, so a value there would be ignored."""
    cidrs = config.security.load_balancer_source_cidrs
    at = ("security", "load_balancer_source_cidrs")
    if config.cluster.mode == "eks" and cidrs:
        return [
            Problem(
                at,
                cidrs,
                "mode 'eks' admits exactly the load-balancer subnets it creates; remove this "
                "key (it is for mode 'existing')",
            )
        ]
    needs = (
        config.cluster.mode == "existing"
        and config.ingress.enabled
        and config.ingress.class_name == "alb"
        and config.security.network_policies
    )
    role = "elb" if config.ingress.scheme == "internet-facing" else "internal-elb"
    if needs and not cidrs:
        return [
            Problem(
                at,
                cidrs,
                (
                    "mode 'existing' with an 'alb' ingress needs the CIDRs of the subnets the ALB's "
                    "ENIs live in "
                    f"(tagged kubernetes.io/role/{role}), "
                    "e.g. ['10.0.200.0/24', '10.0.201.0/24']: only they may reach vLLM's port. Not "
                    "the VPC CIDR, "
                    "which holds every pod and node"
                ),
            )
        ]
    problems = []
    for index, cidr in enumerate(cidrs):
        if cidr == config.cluster.vpc_cidr or cidr.endswith("/0"):
            problems.append(
                Problem(
                    (*at, index),
                    cidr,
                    (
                        "admits every address in the VPC (or anywhere), not only the load balancer: "
                        "name the ALB's own "
                        "subnets"
                    ),
                )
            )
    return problems


def replica_bound_problems(config: PlatformConfig) -> list[Problem]:
    """No more replicas than the GPU group can ever hold: max_size nodes × the replicas one node fits.
    (The quota, the HPA and the PDB are sized from these numbers; 40 on a 2-GPU group is a typo.)"""
    problems = []
    for index, model in enumerate(config.models):
        group = config.node_groups.gpu.get(model.gpu_group)
        if group is None or not group.gpu_instances:
            continue  # reported by the schema (unknown group)
        per_node = max(instance.gpus_per_node for instance in group.gpu_instances) // model.gpus_per_replica
        # A multi-node replica takes nodes_per_replica whole nodes (domain/multi_node.py, which also
        # reports a group too small for one replica).
        most = group.max_size * per_node // model.nodes_per_replica
        if most == 0 and model.is_multi_node:
            continue
        counts: list[tuple[tuple[str | int, ...], int]] = [(("replicas",), model.replicas)]
        if model.autoscaling.enabled:
            counts = [
                (("autoscaling", "min_replicas"), model.autoscaling.min_replicas),
                (("autoscaling", "max_replicas"), model.autoscaling.max_replicas),
            ]
        for key, value in counts:
            if value > most:
                problems.append(
                    Problem(
                        ("models", index, *key),
                        value,
                        (
                            f"GPU group '{model.gpu_group}' holds at most {most} replicas of "
                            f"{model.gpus_per_replica} GPU(s) "
                            f"(node_groups.gpu.{model.gpu_group}.max_size {group.max_size} × "
                            f"{per_node} per node): lower "
                            f"it to {most} or fewer, or raise the group's max_size"
                        ),
                    )
                )
    return problems


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


def operator_key_problems(config: PlatformConfig) -> list[Problem]:
    """The operator key is a secret of its own: a model's key that is also the operator's would hand
    every caller the operator routes (the tenants' keys are checked by the tenants' own check)."""
    operator = config.security.operator_key_secret
    if operator is None:
        return []
    return [
        Problem(
            ("security", "operator_key_secret", "name"),
            operator.name,
            f"is also models[{index}].api_key_secret: every holder of the model's key would reach the "
            "operator routes; give the operator a secret of its own",
        )
        for index, model in enumerate(config.models)
        if model.api_key_secret is not None
        and (model.api_key_secret.name, model.api_key_secret.key) == (operator.name, operator.key)
    ]


@cache
def _policy_rules() -> ModuleType:
    """The policy pack's rules module (stdlib only), so secret names meet the same credential patterns."""
    spec = importlib.util.spec_from_file_location(
        "vllm_policy_rules", REPO_ROOT / "policy" / "vllm_policies.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


# Secrets Manager: 1-512 of letters, digits and /_+=.@- (CreateSecret, Name). Vault: a path of
# segments of letters, digits, '-', '_', '.', no empty segment or leading slash.
_SECRETS_MANAGER_NAME = re.compile(r"^[A-Za-z0-9/_+=.@-]{1,512}$")
_VAULT_PATH = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")


def secret_refs(config: PlatformConfig) -> list[tuple[tuple[str | int, ...], SecretRefConfig]]:
    """Every per-model and per-tenant secret reference, with the key path of its `name`."""
    refs: list[tuple[tuple[str | int, ...], SecretRefConfig]] = []
    for index, model in enumerate(config.models):
        for field in ("api_key_secret", "hf_token_secret"):
            ref = getattr(model, field)
            if ref is not None:
                refs.append((("models", index, field, "name"), ref))
    for index, tenant in enumerate(config.tenants):
        for position, ref in enumerate(tenant.api_key_secrets):
            refs.append((("tenants", index, "api_key_secrets", position, "name"), ref))
    if config.security.operator_key_secret is not None:
        refs.append((("security", "operator_key_secret", "name"), config.security.operator_key_secret))
    return refs


def secret_name_problems(config: PlatformConfig) -> list[Problem]:
    """A secret *name* must be a name: the provider's rules, and never a credential pasted in its place."""
    provider = config.security.secret_store.provider
    problems = []
    for at, ref in secret_refs(config):
        if _policy_rules().looks_like_credential(ref.name):
            # Never echo it back: the value is shown redacted.
            problems.append(
                Problem(
                    at,
                    "(redacted)",
                    (
                        "this looks like a credential, not the name of a secret: put the value "
                        "in the secret store, "
                        "name it here (e.g. 'vllm-platform/prod/llama/api-key'), and rotate the "
                        "exposed credential"
                    ),
                )
            )
        elif provider == "aws-secrets-manager" and not _SECRETS_MANAGER_NAME.match(ref.name):
            problems.append(
                Problem(
                    at,
                    ref.name,
                    (
                        "not a Secrets Manager secret name: 1-512 letters, digits and / _ + = . @ - "
                        "(e.g. 'vllm-platform/prod/llama/api-key')"
                    ),
                )
            )
        elif provider == "vault" and not _VAULT_PATH.match(ref.name):
            problems.append(
                Problem(
                    at,
                    ref.name,
                    (
                        "not a Vault secret path: segments of letters, digits, '-', '_' and '.', "
                        "separated by '/', "
                        "without a leading or trailing '/' (e.g. 'secret/data/vllm/llama')"
                    ),
                )
            )
    return problems


def secret_readers(config: PlatformConfig) -> dict[str, set[tuple[str, str]]]:
    """Who reads which fields of the secret store: `(secret name, key)` per reader, as the IRSA roles
    (infra/aws/irsa.py) and the SecretProviderClasses grant and mount them."""
    from domain.config.tenants import model_key_secrets

    readers: dict[str, set[tuple[str, str]]] = {}
    for model in config.models:
        refs = [*model_key_secrets(config, model), model.hf_token_secret]
        readers[f"model '{model.name}'"] = {(ref.name, ref.key) for ref in refs if ref is not None}
    monitoring = config.monitoring
    if monitoring.enabled and monitoring.prometheus == "kube-prometheus-stack":
        if monitoring.alertmanager and monitoring.alertmanager_config_secret is not None:
            ref = monitoring.alertmanager_config_secret
            readers["Alertmanager"] = {(ref.name, ref.key)}
        if monitoring.grafana and monitoring.grafana_admin_secret is not None:
            name = monitoring.grafana_admin_secret
            readers["Grafana"] = {(name, "admin-user"), (name, "admin-password")}
    return readers


def _secret_field_paths(config: PlatformConfig) -> dict[tuple[str, str], tuple[str | int, ...]]:
    """The first key path of the stack file that names each `(secret, key)`."""
    paths: dict[tuple[str, str], tuple[str | int, ...]] = {}
    for at, ref in secret_refs(config):
        paths.setdefault((ref.name, ref.key), at)
    monitoring = config.monitoring
    if monitoring.alertmanager_config_secret is not None:
        ref = monitoring.alertmanager_config_secret
        paths.setdefault((ref.name, ref.key), ("monitoring", "alertmanager_config_secret", "name"))
    if monitoring.grafana_admin_secret is not None:
        for key in ("admin-user", "admin-password"):
            paths.setdefault((monitoring.grafana_admin_secret, key), ("monitoring", "grafana_admin_secret"))
    return paths


def secret_isolation_problems(config: PlatformConfig) -> list[Problem]:
    """Every secret a pod may read holds only what that pod may know (issue 40).

    Secrets Manager and Vault grant a whole secret: IAM's GetSecretValue (the CSI driver's AWS provider
    fetches the whole secret and picks the key with jmesPath) and a Vault policy's path. Keys kept as
    fields of one shared secret would let every reader of that secret read them all, so a model
    whose role may read it could read every tenant's key there: the per-model separation would be
    void. With `kubernetes-secret` each pod mounts only the keys it names, so fields may share a
    Secret there.
    """
    store = config.security.secret_store.provider
    if store == "kubernetes-secret":
        return []
    grant = (
        "IAM grants a Secrets Manager secret whole (GetSecretValue returns every field)"
        if store == "aws-secrets-manager"
        else "a Vault policy grants a secret path whole"
    )
    readers = secret_readers(config)
    fields: dict[str, set[str]] = {}
    for read in readers.values():
        for name, key in read:
            fields.setdefault(name, set()).add(key)
    paths = _secret_field_paths(config)
    problems: list[Problem] = []
    reported: set[tuple[str, str]] = set()
    for reader, read in readers.items():
        for name in sorted({name for name, _ in read}):
            for key in sorted(fields[name]):
                if (name, key) in read or (name, key) in reported:
                    continue
                reported.add((name, key))
                owners = " and ".join(
                    other for other, other_read in readers.items() if (name, key) in other_read
                )
                own = ", ".join(repr(k) for n, k in sorted(read) if n == name)
                problems.append(
                    Problem(
                        paths[(name, key)],
                        name,
                        f"field '{key}' of this secret is for {owners} only, but {reader} reads the same "
                        f"secret (for {own}) "
                        f"and {grant}: its pods could read this field too. Keep each key in a secret of "
                        f"its own (e.g. '{name}/{key}'), so every secret a pod may read holds only what that "
                        "pod may know",
                    )
                )
    return problems


def to_zero_hostname_problems(config: PlatformConfig) -> list[Problem]:
    """A model that scales to zero has no hostname of its own: the load balancer would answer it 503 at
    once while no pod exists, so its Ingress is not rendered (components/model_service.py
    `serves_own_hostname`) and only the router, which holds requests while it wakes, reaches it."""
    problems = []
    for index, model in enumerate(config.models):
        if model.scales_to_zero and model.ingress_host is not None:
            endpoint = f"https://{config.router.host}" if config.router.host else "the router's endpoint"
            problems.append(
                Problem(
                    ("models", index, "ingress_host"),
                    model.ingress_host,
                    "this model scales to zero (autoscaling.min_replicas 0), so it gets no Ingress of its "
                    "own and nothing would serve this host; remove ingress_host and call it through "
                    f'{endpoint} with "model": "{model.openai_model_name}" (the router holds requests '
                    "while it wakes), or set min_replicas: 1 to keep a hostname",
                )
            )
    return problems


KUBELET_MAX_PODS = 250
"""The most pods an EKS node's kubelet may be configured for (the AMI's max-pods at most): its memory
reservation below is sized for it, so the allocatable is never over-estimated."""
EVICTION_HARD_MEMORY_MIB = 100
"""The kubelet's `evictionHard: memory.available: 100Mi` (the EKS AMIs' default)."""


def kubelet_reserved_millicores(vcpus: int) -> int:
    """CPU the EKS AMIs' kubelet reserves (kubeReserved, amazon-eks-ami's bootstrap formula): 6 % of the
    first core, 1 % of the second, 0.5 % of the next two, 0.25 % of every core above four."""
    steps = ((1, 60), (1, 10), (2, 5), (max(0, vcpus - 4), 2.5))
    reserved, left = 0.0, vcpus
    for cores, per_core in steps:
        taken = min(left, cores)
        reserved += taken * per_core
        left -= taken
    return math.ceil(reserved)


def allocatable(vcpus: int, memory_gib: float) -> tuple[float, float]:
    """(cores, GiB) a node of this size offers pods: capacity less the kubelet's reservation
    (kubeReserved: 255 MiB + 11 MiB per pod at KUBELET_MAX_PODS; evictionHard 100 MiB). DaemonSets are
    not subtracted here: what the stack's own put on GPU nodes is small next to a vLLM pod."""
    reserved_mib = 255 + 11 * KUBELET_MAX_PODS + EVICTION_HARD_MEMORY_MIB
    return vcpus - kubelet_reserved_millicores(vcpus) / 1000, memory_gib - reserved_mib / 1024


def pod_request_problems(config: PlatformConfig) -> list[Problem]:
    """Every model's pod requests (the vLLM container, or the preloader's while it runs first) against
    the allocatable of every instance type its group may launch (issue 50): a request no node of the
    group can hold leaves the pod Pending forever on that type, one-node models and group members alike."""
    problems: list[Problem] = []
    for index, model in enumerate(config.models):
        group = config.node_groups.gpu.get(model.gpu_group)
        if group is None:
            continue  # named by another check
        resources = model.resources
        cpu = max(resources.cpu_request_cores, resources.preload_cpu_request_cores)
        memory = max(resources.memory_request_gib, resources.preload_memory_request_gib)
        for instance_type in sorted(set(group.instance_types)):
            found = lookup_instance_type(instance_type)
            if found is None:
                continue  # named by another check
            cores, gib = allocatable(found.vcpus, found.memory_gib)
            for key, wanted, offered, unit, size in (
                ("cpu_request_cores", cpu, cores, "cores", f"{found.vcpus} vCPUs"),
                ("memory_request_gib", memory, gib, "GiB", f"{found.memory_gib} GiB"),
            ):
                if wanted > offered:
                    problems.append(
                        Problem(
                            ("models", index, "resources", key),
                            getattr(resources, key),
                            f"a pod of this model asks for {wanted:g} {unit}, more than a {instance_type} "
                            f"node of group '{model.gpu_group}' offers pods ({offered:.1f} {unit} of its "
                            f"{size}, after the kubelet's reservation); lower it below {offered:.1f} or "
                            "remove that instance type from the group",
                        )
                    )
    return problems


def karpenter_pool_problems(config: PlatformConfig) -> list[Problem]:
    """GPU groups with `provisioner: karpenter` (components/karpenter.py): the pool's GPU limit holds
    one replica of every model placed on it, nothing in its disruption settings can evict a serving
    pod, and it has a node class and a controller to act on it."""
    problems: list[Problem] = []
    for name, group in config.node_groups.gpu.items():
        if not group.is_karpenter_pool:
            continue
        at = ("node_groups", "gpu", name, "karpenter")
        models = [(index, model) for index, model in enumerate(config.models) if model.gpu_group == name]
        for index, model in models:
            # A multi-node replica is a whole group: every pod of it must fit under the limit, or the
            # last member stays Pending ("exceeds limits for nodepool") while `up` reports success.
            if group.pool_gpu_limit < model.gpus_per_group:
                whole = f"{model.gpus_per_group} GPUs" + (
                    f", a group of {model.nodes_per_replica} pods" if model.is_multi_node else ""
                )
                problems.append(
                    Problem(
                        (*at, "max_gpus"),
                        group.pool_gpu_limit,
                        f"the pool's limit of {group.pool_gpu_limit} GPU(s) is below one replica of model "
                        f"'{model.name}' ({whole}, models[{index}]): Karpenter would never launch every "
                        f"node of it; raise max_gpus (or max_size) to at least {model.gpus_per_group}",
                    )
                )
        version = group.karpenter.ami_version
        bottlerocket = group.ami_type.startswith("BOTTLEROCKET")
        if version != "latest" and bool(re.fullmatch(r"v\d+\.\d+\.\d+", version)) != bottlerocket:
            # Karpenter's alias is <family>@<version>: a version of the other family's format names no
            # AMI, and no node of the pool would ever launch (issue 50).
            family, example = ("Bottlerocket", "v1.26.0") if bottlerocket else ("AL2023", "v20240625")
            problems.append(
                Problem(
                    (*at, "ami_version"),
                    version,
                    f"this group's ami_type {group.ami_type} takes {family} releases (format {example}); "
                    f"'{version}' is the other family's format and names no AMI: use a release of {family} "
                    "or latest",
                )
            )
        # Several models on one pool: one replica of each at once (issue 50 found them checked one by one).
        together = sum(model.gpus_per_group for _, model in models)
        if (
            len(models) > 1
            and group.pool_gpu_limit >= max(m.gpus_per_group for _, m in models)
            and (group.pool_gpu_limit < together)
        ):
            problems.append(
                Problem(
                    (*at, "max_gpus"),
                    group.pool_gpu_limit,
                    f"the pool's limit of {group.pool_gpu_limit} GPU(s) holds no replica of every model "
                    f"placed on it at once ({', '.join(repr(m.name) for _, m in models)}: {together} "
                    f"GPUs): raise max_gpus (or max_size) to at least {together}",
                )
            )
        if models and group.karpenter.termination_grace_period_minutes is not None:
            problems.append(
                Problem(
                    (*at, "termination_grace_period_minutes"),
                    group.karpenter.termination_grace_period_minutes,
                    "with a terminationGracePeriod Karpenter deletes pods that carry "
                    "karpenter.sh/do-not-disrupt when it drifts or expires their node (upstream "
                    "concepts/disruption.md), which would evict serving pods of "
                    f"{', '.join(repr(m.name) for _, m in models)}; remove it (null): an expired or drifted "
                    "node is then replaced once its serving pods have gone by rollout or scale-in",
                )
            )
        if config.cluster.mode == "existing" and group.karpenter.node_class is None:
            problems.append(
                Problem(
                    (*at, "node_class"),
                    None,
                    "mode 'existing' creates no EC2NodeClass: name the node class the cluster's Karpenter "
                    "already has (node_class: {name: <its name>}), or use provisioner: managed",
                )
            )
        if config.cluster.mode == "eks" and group.karpenter.node_class is not None:
            problems.append(
                Problem(
                    (*at, "node_class"),
                    group.karpenter.node_class.name,
                    "mode 'eks' creates the pool's own EC2NodeClass (subnets, security groups, node role "
                    "of this stack); remove node_class",
                )
            )
        if config.cluster.mode == "eks" and not config.addons.karpenter.enabled:
            problems.append(
                Problem(
                    ("addons", "karpenter", "enabled"),
                    False,
                    f"GPU group '{name}' is a Karpenter pool, and without Karpenter's controller no node "
                    "would ever be launched for it; switch addons.karpenter on, or use provisioner: managed",
                )
            )
    return problems
