"""Which keys of the secret store a pod or a wake gate reads, and under which file names: what the
Kubernetes layer mounts (components/secrets.py, components/router.py) and what the AWS layer's IRSA
roles may read (infra/aws/irsa.py), from one list so the two never differ."""

from __future__ import annotations

from dataclasses import dataclass

from domain.config.models import ModelConfig, SecretRefConfig
from domain.config.platform import PlatformConfig
from domain.config.tenants import tenants_on


@dataclass(frozen=True)
class SecretFile:
    """One secret of the store, exposed to the pod as `file` under the secrets mount."""

    ref: SecretRefConfig
    file: str


def tenant_key_file_name(tenant: str, index: int) -> str:
    return f"{tenant}.key{index}"


OPERATOR_KEY_FILE = "platform-operator.key"
"""The operator key's file in the same folder (issue 34); never `<tenant>.key<n>`, so never a tenant's."""


def gated_models(config: PlatformConfig) -> list[tuple[int, ModelConfig]]:
    """(index, model) of every model that may be at zero replicas: each gets a wake gate."""
    return [(index, model) for index, model in enumerate(config.models) if model.scales_to_zero]


def model_key_file(model: ModelConfig) -> SecretFile:
    """Without tenants: the model's own key, as the gate's file `<model>.api-key`."""
    assert model.api_key_secret is not None  # filled by the loader (resolve_stack_defaults)
    return SecretFile(model.api_key_secret, f"{model.name}.api-key")


def wake_gate_key_files(config: PlatformConfig) -> list[SecretFile]:
    """Every key the wake gates read, once each: what the SecretProviderClass mounts (and the IRSA role
    of the router's service account may read). Nothing when no model scales to zero."""
    files: dict[str, SecretFile] = {}
    for _, model in gated_models(config):
        if config.tenants:
            for tenant in tenants_on(config, model):
                for n, ref in enumerate(tenant.api_key_secrets):
                    files.setdefault(
                        tenant_key_file_name(tenant.name, n),
                        SecretFile(ref, tenant_key_file_name(tenant.name, n)),
                    )
        else:
            key = model_key_file(model)
            files.setdefault(key.file, key)
        operator = config.security.operator_key_secret
        if operator is not None:
            files.setdefault(OPERATOR_KEY_FILE, SecretFile(operator, OPERATOR_KEY_FILE))
    return list(files.values())
