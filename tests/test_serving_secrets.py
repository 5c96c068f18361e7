"""API key and Hugging Face token: from the secret store through the CSI driver, never as literals."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from components import secrets, server_auth
from domain.config import ConfigError
from domain.config.loader import stack_file_for
from infra.render import RenderResult
from infra.stack_checks import load_stack
from tests.conftest import rendered
from tests.test_serving_render import (
    config_of,
    container,
    model_namespace_objects,
    one,
    pod_spec,
    render_variant,
)

SECRET_LIKE = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)


def test_no_secret_values_in_env_literals_or_configmaps(stack_render: RenderResult) -> None:
    objects = model_namespace_objects(stack_render)
    assert not [o for o in objects if o["kind"] == "Secret"], "no Secret is rendered"
    # The one ConfigMap is the API-key check's code, byte for byte the repository's file: no key.
    config_maps = [o for o in objects if o["kind"] == "ConfigMap"]
    assert {o["metadata"]["name"] for o in config_maps} == {server_auth.CONFIG_MAP_NAME}
    tenants = config_of(stack_render).tenants
    for config_map in config_maps:
        data = dict(config_map["data"])
        # With tenants, beside the code: who may call which name, and the keys' non-secret prefixes.
        document = data.pop(server_auth.TENANTS_FILE, None)
        assert (document is not None) == bool(tenants)
        if document is not None:
            # isolated_prefix_cache: a boolean (security.tenants_share_prefix_cache), no secret.
            assert set(json.loads(document)) == {"served_names", "tenants", "isolated_prefix_cache"}
            assert isinstance(json.loads(document)["isolated_prefix_cache"], bool)
            assert all(
                set(t) == {"models", "key_prefix", "max_in_flight"}
                for t in json.loads(document)["tenants"].values()
            )
        assert data == {server_auth.MODULE_FILE.name: server_auth.MODULE_FILE.read_text()}
    for model in config_of(stack_render).models:
        spec = pod_spec(stack_render, model.name)
        for item in spec["containers"] + spec["initContainers"]:
            for env in item.get("env", []):
                if SECRET_LIKE.search(env["name"]):
                    assert "value" not in env and "secretKeyRef" in env["valueFrom"], env
            assert not [a for a in item.get("args", []) if a.startswith("--api-key")], item["name"]
        api_keys = [e for e in container(spec)["env"] if e["name"] == "VLLM_API_KEY"]
        if tenants:  # their keys are files of the CSI mount (tests/test_tenants_render.py)
            assert api_keys == []
        else:
            assert set(api_keys[0]["valueFrom"]) == {"secretKeyRef"}


def test_api_key_secret_is_synced_by_a_csi_volume_the_server_mounts(stack_render: RenderResult) -> None:
    config = config_of(stack_render)
    if config.tenants:
        # No per-model key at all: tests/test_tenants_render.py checks the tenants' key files.
        assert stack_render.find("SecretProviderClass", name=secrets.API_KEY_PROVIDER_CLASS) == []
        return
    for model in config.models:
        provider = one(stack_render, "SecretProviderClass", secrets.API_KEY_PROVIDER_CLASS, model.namespace)[
            "spec"
        ]
        synced = provider["secretObjects"]
        spec = pod_spec(stack_render, model.name)
        ref = next(e for e in container(spec)["env"] if e["name"] == "VLLM_API_KEY")["valueFrom"][
            "secretKeyRef"
        ]
        assert synced == [
            {
                "secretName": ref["name"],
                "type": "Opaque",
                "data": [{"objectName": secrets.API_KEY_FILE, "key": ref["key"]}],
            }
        ]
        csi = next(v for v in spec["volumes"] if v["name"] == secrets.API_KEY_VOLUME)["csi"]
        assert csi["driver"] == "secrets-store.csi.k8s.io"
        assert csi["volumeAttributes"] == {"secretProviderClass": secrets.API_KEY_PROVIDER_CLASS}
        # The driver syncs only while a running container mounts the volume.
        mounts = {m["name"] for m in container(spec)["volumeMounts"]}
        assert secrets.API_KEY_VOLUME in mounts


def test_secrets_manager_provider_reads_the_configured_key_with_jmespath() -> None:
    result = rendered("dev")  # prod has tenants: their keys, tests/test_tenants_render.py
    config = config_of(result)
    assert config.security.secret_store.provider == "aws-secrets-manager"
    for model in config.models:
        spec = one(result, "SecretProviderClass", secrets.API_KEY_PROVIDER_CLASS, model.namespace)["spec"]
        assert spec["provider"] == "aws"
        assert spec["parameters"]["region"] == config.cluster.region
        objects = yaml.safe_load(spec["parameters"]["objects"])
        assert objects == [
            {
                "objectName": f"vllm-platform/dev/{model.name}/api-key",
                "objectType": "secretsmanager",
                "objectAlias": "api-key.json",
                "jmesPath": [{"path": "value", "objectAlias": "api-key"}],
            }
        ]


def test_vault_provider_names_address_role_and_secret_path() -> None:
    result = rendered("staging")
    store = config_of(result).security.secret_store
    assert store.provider == "vault"
    for model in config_of(result).models:
        spec = one(result, "SecretProviderClass", secrets.API_KEY_PROVIDER_CLASS, model.namespace)["spec"]
        assert spec["provider"] == "vault"
        parameters = spec["parameters"]
        assert parameters["vaultAddress"] == store.vault_address
        assert parameters["roleName"] == store.vault_role
        assert parameters["vaultKubernetesMountPath"] == store.vault_kubernetes_mount_path
        assert yaml.safe_load(parameters["objects"]) == [
            {
                "objectName": "api-key",
                "secretPath": f"vllm-platform/staging/{model.name}/api-key",
                "secretKey": "value",
            }
        ]


def kubernetes_secret_store(values: dict[str, Any]) -> None:
    values["security"] = {"secret_store": {"provider": "kubernetes-secret"}}
    values["models"][0]["api_key_secret"] = {"name": "qwen-api-key", "key": "token"}


def test_kubernetes_secret_opt_in_references_an_existing_secret_without_csi(tmp_path: Path) -> None:
    result = render_variant(tmp_path, kubernetes_secret_store)
    namespace = "vllm-qwen2-5-7b"
    assert result.find("SecretProviderClass") == []
    assert result.find("Secret", namespace=namespace) == []
    spec = pod_spec(result, "qwen2-5-7b")
    api_key = next(e for e in container(spec)["env"] if e["name"] == "VLLM_API_KEY")
    assert api_key["valueFrom"] == {"secretKeyRef": {"name": "qwen-api-key", "key": "token"}}
    assert not [v for v in spec["volumes"] if "csi" in v]


def test_kubernetes_secret_opt_in_rejects_secret_store_style_names(tmp_path: Path) -> None:
    document = yaml.safe_load(stack_file_for("dev").read_text())
    document["config"]["vllm-platform:security"] = {"secret_store": {"provider": "kubernetes-secret"}}
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError) as caught:
        load_stack("dev", stack_file=path)
    message = str(caught.value)
    assert "models[0].api_key_secret.name" in message
    assert "vllm-platform/dev/qwen2-5-7b/api-key" in message
    assert "existing Secret in namespace vllm-qwen2-5-7b" in message


def gated_hf_model(values: dict[str, Any]) -> None:
    values["models"][0]["source"]["requires_hf_token"] = True


def test_hf_token_reaches_only_the_preloader_as_a_file(tmp_path: Path) -> None:
    result = render_variant(tmp_path, gated_hf_model)
    namespace = "vllm-qwen2-5-7b"
    provider = one(result, "SecretProviderClass", secrets.HF_TOKEN_PROVIDER_CLASS, namespace)["spec"]
    assert "secretObjects" not in provider, "the token is never synced into a Kubernetes Secret"
    objects = yaml.safe_load(provider["parameters"]["objects"])
    assert objects[0]["objectName"] == "vllm-platform/dev/qwen2-5-7b/hf-token"
    assert objects[0]["jmesPath"] == [{"path": "value", "objectAlias": secrets.HF_TOKEN_FILE}]
    spec = pod_spec(result, "qwen2-5-7b")
    preload = container(spec, "model-cache")
    args = preload["args"]
    assert args[args.index("--hf-token-file") + 1] == secrets.HF_TOKEN_PATH == "/mnt/secrets/hf-token"
    assert {"name": secrets.HF_TOKEN_VOLUME, "mountPath": "/mnt/secrets", "readOnly": True} in preload[
        "volumeMounts"
    ]
    assert secrets.HF_TOKEN_VOLUME not in {m["name"] for m in container(spec)["volumeMounts"]}


def test_hf_token_from_an_existing_secret_with_the_kubernetes_opt_in(tmp_path: Path) -> None:
    def both(values: dict[str, Any]) -> None:
        kubernetes_secret_store(values)
        gated_hf_model(values)
        values["models"][0]["hf_token_secret"] = {"name": "hf-token", "key": "token"}

    spec = pod_spec(render_variant(tmp_path, both), "qwen2-5-7b")
    token = next(v for v in spec["volumes"] if v["name"] == secrets.HF_TOKEN_VOLUME)
    assert token["secret"]["secretName"] == "hf-token"
    assert token["secret"]["items"] == [{"key": "token", "path": secrets.HF_TOKEN_FILE}]
    assert int(token["secret"]["defaultMode"]) & 0o004, "readable by the preloader's non-root user"


def test_json_keys_that_are_not_identifiers_are_quoted_for_jmespath() -> None:
    from domain.config.models import SecretRefConfig
    from domain.config.platform import SecretStoreConfig

    parameters = secrets.provider_parameters(
        SecretStoreConfig(),
        secrets.SecretFile(SecretRefConfig(name="a/b", key="api-key"), "api-key"),
        "us-east-1",
    )
    assert yaml.safe_load(parameters["objects"])[0]["jmesPath"][0]["path"] == '"api-key"'
