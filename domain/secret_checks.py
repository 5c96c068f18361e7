"""The stack's secrets: every reference's name in its store's syntax, the operator key, and who may read
which secret (a secret read by two models' or tenants' pods would let one use the other's key)."""

from __future__ import annotations

import importlib.util
import re
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

from domain.config.errors import Problem
from domain.config.models import SecretRefConfig
from domain.config.platform import PlatformConfig

REPO_ROOT = Path(__file__).resolve().parents[1]


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
