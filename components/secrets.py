"""Where a model pod's secrets come from: SecretProviderClass builders and pod wiring (pure).

The API key and the Hugging Face token live in the configured secret store, never in the program,
the stack file or a ConfigMap:

- `aws-secrets-manager` (default) and `vault`: the Secrets Store CSI driver mounts them into the pod.
  The API key's SecretProviderClass also syncs it into a Kubernetes Secret (`secretObjects`) so
  `VLLM_API_KEY` can use a secretKeyRef; the driver only syncs while a pod mounts the volume, so
  the vLLM container mounts it. The HF token is a file for the preloader only (no synced Secret).
- `kubernetes-secret` (explicit opt-in): an existing Secret in the model namespace, created out of
  band, referenced by name.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from domain.config.errors import Problem
from domain.config.models import ModelConfig, SecretRefConfig
from domain.config.platform import PlatformConfig, SecretStoreConfig
from domain.key_files import OPERATOR_KEY_FILE, SecretFile, tenant_key_file_name

CSI_DRIVER = "secrets-store.csi.k8s.io"
SPC_API_VERSION = "secrets-store.csi.x-k8s.io/v1"

SECRETS_MOUNT_PATH = "/mnt/secrets"
API_KEY_FILE = "api-key"
HF_TOKEN_FILE = "hf-token"
HF_TOKEN_PATH = f"{SECRETS_MOUNT_PATH}/{HF_TOKEN_FILE}"
"""What the preloader gets as `--hf-token-file`."""

API_KEY_SECRET_NAME = "vllm-api-key"
"""The Kubernetes Secret `VLLM_API_KEY` reads (synced by the CSI driver from the secret store)."""
API_KEY_PROVIDER_CLASS = "vllm-api-key"
HF_TOKEN_PROVIDER_CLASS = "vllm-hf-token"
API_KEY_VOLUME = "api-key"
HF_TOKEN_VOLUME = "hf-token"

_JMESPATH_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


def uses_csi(store: SecretStoreConfig) -> bool:
    return store.provider != "kubernetes-secret"


def _jmespath(key: str) -> str:
    # A JSON key like `api-key` is not a bare JMESPath identifier; quoted, any key works.
    if _JMESPATH_IDENTIFIER.match(key):
        return key
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _aws_objects(secret: SecretFile) -> list[dict[str, Any]]:
    return [
        {
            "objectName": secret.ref.name,
            "objectType": "secretsmanager",
            # Secret names contain '/', which the AWS provider cannot use as a file name: alias it.
            "objectAlias": f"{secret.file}.json",
            "jmesPath": [{"path": _jmespath(secret.ref.key), "objectAlias": secret.file}],
        }
    ]


def _vault_objects(secret: SecretFile) -> list[dict[str, Any]]:
    return [{"objectName": secret.file, "secretPath": secret.ref.name, "secretKey": secret.ref.key}]


def provider_parameters(store: SecretStoreConfig, secret: SecretFile, region: str) -> dict[str, str]:
    """The `parameters` of a SecretProviderClass; `objects` is a YAML string, as both providers expect."""
    if store.provider == "aws-secrets-manager":
        # Credentials: the pod's service account through IRSA (the driver requests its token).
        return {"objects": yaml.safe_dump(_aws_objects(secret), sort_keys=False), "region": region}
    if store.provider == "vault":
        assert store.vault_address and store.vault_role  # guaranteed by SecretStoreConfig
        return {
            "vaultAddress": store.vault_address,
            "roleName": store.vault_role,
            "vaultKubernetesMountPath": store.vault_kubernetes_mount_path,
            "objects": yaml.safe_dump(_vault_objects(secret), sort_keys=False),
        }
    raise ValueError(f"provider {store.provider!r} does not use a SecretProviderClass")


def secret_provider_class_spec(
    store: SecretStoreConfig, secret: SecretFile, region: str, *, sync_to_secret: str | None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "provider": "aws" if store.provider == "aws-secrets-manager" else "vault",
        "parameters": provider_parameters(store, secret, region),
    }
    if sync_to_secret is not None:
        spec["secretObjects"] = [
            {
                "secretName": sync_to_secret,
                "type": "Opaque",
                "data": [{"objectName": secret.file, "key": secret.file}],
            }
        ]
    return spec


def api_key_file(model: ModelConfig) -> SecretFile:
    assert model.api_key_secret is not None  # filled by the loader (resolve_stack_defaults)
    return SecretFile(model.api_key_secret, API_KEY_FILE)


def hf_token_file(model: ModelConfig) -> SecretFile | None:
    if not model.needs_hf_token:
        return None
    assert model.hf_token_secret is not None  # filled by the loader when requires_hf_token
    return SecretFile(model.hf_token_secret, HF_TOKEN_FILE)


def api_key_env(store: SecretStoreConfig, model: ModelConfig) -> dict[str, Any]:
    """`VLLM_API_KEY` from a Secret: the CSI-synced one, or the user's own with `kubernetes-secret`."""
    secret = api_key_file(model)
    if uses_csi(store):
        ref = {"name": API_KEY_SECRET_NAME, "key": API_KEY_FILE}
    else:
        ref = {"name": secret.ref.name, "key": secret.ref.key}
    return {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": ref}}


def api_key_volume(store: SecretStoreConfig) -> dict[str, Any] | None:
    """The CSI volume the vLLM container mounts so the driver syncs the API key Secret."""
    if not uses_csi(store):
        return None
    return csi_volume(API_KEY_VOLUME, API_KEY_PROVIDER_CLASS)


def hf_token_volume(store: SecretStoreConfig, model: ModelConfig) -> dict[str, Any] | None:
    """The preloader's token file, `hf-token`, from the store or the user's Secret."""
    token = hf_token_file(model)
    if token is None:
        return None
    if uses_csi(store):
        return csi_volume(HF_TOKEN_VOLUME, HF_TOKEN_PROVIDER_CLASS)
    return {
        "name": HF_TOKEN_VOLUME,
        "secret": {
            "secretName": token.ref.name,
            "items": [{"key": token.ref.key, "path": HF_TOKEN_FILE}],
            "defaultMode": 0o444,  # the preloader runs as a non-root uid; only its container mounts it
        },
    }


def secret_reference_problems(config: PlatformConfig) -> list[Problem]:
    """With `kubernetes-secret`, secret refs name Secrets in the model namespace, so they must be
    valid Secret names and keys — the store-style default (`vllm-platform/<stack>/...`) is not."""
    if uses_csi(config.security.secret_store):
        return []
    from domain.config.tenants import tenants_on

    problems = []
    refs: list[tuple[tuple[str | int, ...], SecretRefConfig | None, str]] = []
    for index, model in enumerate(config.models):
        for field in ("api_key_secret", "hf_token_secret"):
            refs.append((("models", index, field), getattr(model, field), f"namespace {model.namespace}"))
    for index, tenant in enumerate(config.tenants):
        namespaces = ", ".join(m.namespace for m in config.models if tenant in tenants_on(config, m))
        for position, ref in enumerate(tenant.api_key_secrets):
            refs.append((("tenants", index, "api_key_secrets", position), ref, f"namespaces {namespaces}"))
    every_namespace = "namespaces " + ", ".join(m.namespace for m in config.models)
    refs.append((("security", "operator_key_secret"), config.security.operator_key_secret, every_namespace))
    for at, ref, where in refs:
        if ref is None:
            continue
        if len(ref.name) > 253 or not _SECRET_NAME.match(ref.name):
            problems.append(
                Problem(
                    (*at, "name"),
                    ref.name,
                    "with security.secret_store.provider 'kubernetes-secret' this names an existing Secret "
                    f"in {where} (created out of band), so it must be a Kubernetes name "
                    "such as 'vllm-api-key': lowercase letters, digits, '-' and '.'",
                )
            )
        if not _SECRET_KEY.match(ref.key):
            problems.append(
                Problem(
                    (*at, "key"),
                    ref.key,
                    "a Kubernetes Secret key has only letters, digits, '-', '_' and '.' (e.g. 'value')",
                )
            )
    return problems


def keys_provider_class_spec(
    store: SecretStoreConfig, store_name: str, files: dict[str, str], region: str, *, sync_to_secret: str
) -> dict[str, Any]:
    """A SecretProviderClass for several keys of one store entry (`files`: file name -> key in the
    entry), all synced into `sync_to_secret` under their file names. For the monitoring stack's own
    secrets (Alertmanager's configuration, Grafana's admin credential)."""
    if store.provider == "aws-secrets-manager":
        objects: list[dict[str, Any]] = [
            {
                "objectName": store_name,
                "objectType": "secretsmanager",
                "objectAlias": f"{sync_to_secret}.json",
                "jmesPath": [{"path": _jmespath(key), "objectAlias": file} for file, key in files.items()],
            }
        ]
        parameters = {"objects": yaml.safe_dump(objects, sort_keys=False), "region": region}
        provider = "aws"
    elif store.provider == "vault":
        assert store.vault_address and store.vault_role  # guaranteed by SecretStoreConfig
        objects = [
            {"objectName": file, "secretPath": store_name, "secretKey": key} for file, key in files.items()
        ]
        parameters = {
            "vaultAddress": store.vault_address,
            "roleName": store.vault_role,
            "vaultKubernetesMountPath": store.vault_kubernetes_mount_path,
            "objects": yaml.safe_dump(objects, sort_keys=False),
        }
        provider = "vault"
    else:
        raise ValueError(f"provider {store.provider!r} does not use a SecretProviderClass")
    return {
        "provider": provider,
        "parameters": parameters,
        "secretObjects": [
            {
                "secretName": sync_to_secret,
                "type": "Opaque",
                "data": [{"objectName": file, "key": file} for file in files],
            }
        ],
    }


def csi_volume(name: str, provider_class: str) -> dict[str, Any]:
    """A pod volume through which the CSI driver mounts (and syncs) `provider_class`'s secrets."""
    return {
        "name": name,
        "csi": {
            "driver": CSI_DRIVER,
            "readOnly": True,
            "volumeAttributes": {"secretProviderClass": provider_class},
        },
    }


# --- tenants (issue 26) ---------------------------------------------------------------------------
# With `tenants`, a vLLM pod gets no VLLM_API_KEY: the CSI driver mounts the keys of the tenants
# allowed on its served names as files, which the driver rewrites on rotation (an environment
# variable from a synced Secret is read once, at start), and the middleware re-reads them.

TENANT_KEYS_PROVIDER_CLASS = "vllm-tenant-keys"
TENANT_KEYS_VOLUME = "tenant-keys"
TENANT_KEYS_MOUNT_PATH = "/mnt/tenant-keys"
"""The middleware's key folder (`VLLM_PLATFORM_TENANT_MOUNT`): one file per key, `<tenant>.key<n>`."""


def tenant_key_files(config: PlatformConfig, model: ModelConfig) -> list[SecretFile]:
    """The files of the pod's key folder: the keys of every tenant allowed on one of `model`'s served
    names, and the operator key (`security.operator_key_secret`) where the stack has one."""
    from domain.config.tenants import tenants_on

    files = [
        SecretFile(ref, tenant_key_file_name(tenant.name, index))
        for tenant in tenants_on(config, model)
        for index, ref in enumerate(tenant.api_key_secrets)
    ]
    if config.security.operator_key_secret is not None:
        files.append(SecretFile(config.security.operator_key_secret, OPERATOR_KEY_FILE))
    return files


def tenant_keys_provider_class_spec(
    store: SecretStoreConfig, files: list[SecretFile], region: str
) -> dict[str, Any]:
    """A SecretProviderClass mounting every tenant key of a pod; nothing is synced to a Secret."""
    if store.provider == "aws-secrets-manager":
        # One object per store entry (the provider refuses an entry named twice), one file per key.
        entries: dict[str, list[SecretFile]] = {}
        for secret in files:
            entries.setdefault(secret.ref.name, []).append(secret)
        objects: list[dict[str, Any]] = [
            {
                "objectName": name,
                "objectType": "secretsmanager",
                # Entry names contain '/', which cannot be a file name; the JSON copy gets a plain alias
                # the middleware ignores (it reads `<tenant>.key<n>` files only).
                "objectAlias": f"entry-{position}.json",
                "jmesPath": [
                    {"path": _jmespath(secret.ref.key), "objectAlias": secret.file} for secret in keys
                ],
            }
            for position, (name, keys) in enumerate(entries.items())
        ]
        return {
            "provider": "aws",
            "parameters": {"objects": yaml.safe_dump(objects, sort_keys=False), "region": region},
        }
    if store.provider == "vault":
        assert store.vault_address and store.vault_role  # guaranteed by SecretStoreConfig
        return {
            "provider": "vault",
            "parameters": {
                "vaultAddress": store.vault_address,
                "roleName": store.vault_role,
                "vaultKubernetesMountPath": store.vault_kubernetes_mount_path,
                "objects": yaml.safe_dump(
                    [obj for secret in files for obj in _vault_objects(secret)], sort_keys=False
                ),
            },
        }
    raise ValueError(f"provider {store.provider!r} does not use a SecretProviderClass")


def tenant_keys_volume(store: SecretStoreConfig, files: list[SecretFile]) -> dict[str, Any]:
    """The key folder: the CSI driver's mount, or (`kubernetes-secret`) the user's Secrets projected
    into one folder, which the kubelet also updates in place."""
    if uses_csi(store):
        return csi_volume(TENANT_KEYS_VOLUME, TENANT_KEYS_PROVIDER_CLASS)
    return {
        "name": TENANT_KEYS_VOLUME,
        "projected": {
            "defaultMode": 0o444,
            "sources": [
                {"secret": {"name": secret.ref.name, "items": [{"key": secret.ref.key, "path": secret.file}]}}
                for secret in files
            ],
        },
    }


def tenant_keys_volume_mount() -> dict[str, Any]:
    return {"name": TENANT_KEYS_VOLUME, "mountPath": TENANT_KEYS_MOUNT_PATH, "readOnly": True}
