"""What the stack hands the middleware for issue 34: the optional operator key (mounted like the
tenants' keys, readable by the model's IRSA role), the request-body limit, and each tenant's
in-flight share of `max_concurrent_requests`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from components import secrets, server_auth
from components.vllm_pod import _volumes
from domain.config import stack_file_for
from domain.config.tenants import model_key_secrets
from infra.stack_checks import load_stack
from tests.support.auth_module import load_auth_module

OPERATOR = {"name": "vllm-platform/prod/operator/api-key"}


def _stack(tmp_path: Path, base: str, **security: Any) -> Any:
    document = yaml.safe_load(stack_file_for(base).read_text())
    document["config"].setdefault("vllm-platform:security", {}).update(security)
    path = tmp_path / "Pulumi.variant.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_stack("variant", stack_file=path)


def _env(config: Any, model: Any = None) -> dict[str, str]:
    return {e["name"]: e["value"] for e in server_auth.environment(config, model)}


def test_without_an_operator_key_no_pod_mounts_or_names_one(tmp_path: Path) -> None:
    for base in ("dev", "prod"):
        config = load_stack(base)
        assert config.security.operator_key_secret is None
        assert "VLLM_PLATFORM_OPERATOR_KEY_FILE" not in _env(config)
        for model in config.models:
            names = [f.file for f in secrets.tenant_key_files(config, model)]
            assert secrets.OPERATOR_KEY_FILE not in names


def test_the_operator_key_is_a_file_beside_the_tenants_keys_in_both_modes(tmp_path: Path) -> None:
    for base in ("dev", "prod"):
        config = _stack(tmp_path, base, operator_key_secret=OPERATOR)
        path = f"{secrets.TENANT_KEYS_MOUNT_PATH}/{secrets.OPERATOR_KEY_FILE}"
        assert _env(config)["VLLM_PLATFORM_OPERATOR_KEY_FILE"] == path
        for model in config.models:
            files = secrets.tenant_key_files(config, model)
            assert [(f.ref.name, f.file) for f in files if f.file == secrets.OPERATOR_KEY_FILE] == [
                (OPERATOR["name"], secrets.OPERATOR_KEY_FILE)
            ]
            assert secrets.TENANT_KEYS_VOLUME in {v["name"] for v in _volumes(config, model)}
            # The pod's IRSA role may read it (the CSI driver reads the store as the pod).
            assert OPERATOR["name"] in {ref.name for ref in model_key_secrets(config, model)}
    # Without tenants the model's own key stays where it was, beside the operator key.
    dev = _stack(tmp_path, "dev", operator_key_secret=OPERATOR)
    assert "VLLM_API_KEY" not in _env(dev)  # the env var comes from the Secret, not server_auth
    assert secrets.API_KEY_VOLUME in {v["name"] for v in _volumes(dev, dev.models[0])}


def test_the_body_limit_reaches_the_middleware_in_bytes(tmp_path: Path) -> None:
    assert _env(load_stack("dev"))["VLLM_PLATFORM_MAX_BODY_BYTES"] == str(16 * 1024 * 1024)
    config = _stack(tmp_path, "dev", max_request_body_mib=2)
    assert _env(config)["VLLM_PLATFORM_MAX_BODY_BYTES"] == str(2 * 1024 * 1024)


def test_a_tenants_in_flight_share_spreads_its_limit_over_the_fewest_replicas_not_their_processes() -> None:
    """Issue 49: the pod's API-server processes count one share together (the middleware's
    PodInFlight), so the share is the limit over the fewest replicas, however many processes a pod
    runs; dividing by them too refused a tenant below its limit."""
    config = load_stack("prod")
    model = config.models[0]  # autoscaling, min_replicas 2
    assert model.autoscaling.enabled and model.autoscaling.min_replicas == 2

    def with_args(*args: str) -> Any:
        return model.model_copy(update={"vllm": model.vllm.model_copy(update={"extra_args": list(args)})})

    one = with_args()
    assert one.api_server_count == 1
    assert server_auth.in_flight_share(64, one) == 32
    assert server_auth.in_flight_share(3, one) == 2  # rounded up: never below the limit in total
    assert server_auth.in_flight_share(1, one) == 1
    four = with_args("--api-server-count", "4")
    assert four.api_server_count == 4 and server_auth.in_flight_share(64, four) == 32
    assert with_args("-asc=2").api_server_count == 2
    document = server_auth.tenants_document(config, model)
    limits = {t.name: t.max_concurrent_requests for t in config.tenants}
    for name, tenant in document["tenants"].items():
        expected = None if limits[name] is None else server_auth.in_flight_share(limits[name], model)
        assert tenant["max_in_flight"] == expected
    assert any(t["max_in_flight"] for t in document["tenants"].values())
    json.dumps(document)  # what the ConfigMap holds


def _prod_without_research_limit(tmp_path: Path, **security: Any) -> Any:
    document = yaml.safe_load(stack_file_for("prod").read_text())
    for tenant in document["config"]["vllm-platform:tenants"]:
        if tenant["name"] == "research":
            del tenant["max_concurrent_requests"]
    document["config"].setdefault("vllm-platform:security", {}).update(security)
    path = tmp_path / "Pulumi.variant.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_stack("variant", stack_file=path)


def test_a_tenant_without_a_limit_on_a_shared_model_gets_an_even_split_of_its_engine_slots(
    tmp_path: Path,
) -> None:
    """Issue 40: without a share one tenant's flood slowed another 30x. On a model other tenants may
    call, a tenant that sets no limit gets max_num_seqs x fewest replicas / tenants; alone, none."""
    from domain.capacity import plan_platform
    from domain.capacity.report import format_plan_table, plan_as_json

    config = _prod_without_research_limit(tmp_path)
    shared = next(m for m in config.models if m.name == "llama-3-1-8b")  # search and research
    alone = next(m for m in config.models if m.name == "llama-3-1-70b")  # research only
    fewest = shared.autoscaling.min_replicas
    expected = fewest * shared.vllm.max_num_seqs // 2
    tenants = server_auth.tenants_document(config, shared)["tenants"]
    assert tenants["research"]["max_in_flight"] == server_auth.in_flight_share(expected, shared)
    assert tenants["search"]["max_in_flight"] == server_auth.in_flight_share(64, shared)  # its own
    assert server_auth.tenants_document(config, alone)["tenants"]["research"]["max_in_flight"] is None
    # `plan` states it, in its table and its JSON.
    plan = plan_platform(config)
    rows = {(r["model"], r["tenant"]): r for r in plan_as_json(plan)["tenants"]}
    assert rows[("llama-3-1-8b", "research")] == {
        "model": "llama-3-1-8b",
        "tenant": "research",
        "max_concurrent_requests": expected,
        "per_pod": server_auth.in_flight_share(expected, shared),
        "source": "default",
    }
    assert rows[("llama-3-1-70b", "research")]["source"] == "none"
    table = format_plan_table(plan)
    assert any(
        "llama-3-1-8b" in line and "research" in line and str(expected) in line and "default" in line
        for line in table.splitlines()
    ), table


def test_tenants_get_a_prefix_cache_of_their_own_unless_the_stack_shares_it(tmp_path: Path) -> None:
    prod = load_stack("prod")
    assert server_auth.tenants_document(prod, prod.models[0])["isolated_prefix_cache"] is True
    shared = _stack(tmp_path, "prod", tenants_share_prefix_cache=True)
    assert server_auth.tenants_document(shared, shared.models[0])["isolated_prefix_cache"] is False


def test_the_json_value_count_follows_each_models_context_unless_the_stack_sets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prod = load_stack("prod")
    counts = {m.name: int(_env(prod, m)["VLLM_PLATFORM_MAX_JSON_VALUES"]) for m in prod.models}
    # 4 values per context token (a token-ID prompt as long as the context, or a chat whose every
    # message holds a token) plus 16,384 for tools and the other fields.
    assert counts == {m.name: 4 * m.vllm.max_model_len + 16_384 for m in prod.models}
    assert len(set(counts.values())) > 1, "prod's models have different contexts, so different bounds"
    # A full-context prompt of token IDs passes the middleware's count; the bound is far below the
    # 5.6 million values of the probe's body.
    monkeypatch.setenv("VLLM_API_KEY", "k")
    auth = load_auth_module(monkeypatch, "vllm_platform_auth_value_count")
    for model in prod.models:
        shape = auth.JsonShape(counts[model.name])
        shape.feed(
            json.dumps({"model": model.name, "prompt": list(range(model.vllm.max_model_len))}).encode()
        )
        assert counts[model.name] < 5_600_000 // 20
    config = _stack(tmp_path, "dev", max_request_json_values=2_000_000)
    assert {_env(config, m)["VLLM_PLATFORM_MAX_JSON_VALUES"] for m in config.models} == {"2000000"}
    # Without a model (the ConfigMap's shared part) no bound is rendered: it is per model.
    assert "VLLM_PLATFORM_MAX_JSON_VALUES" not in _env(config)


def test_each_tenants_share_of_the_event_loop_reaches_the_middleware(tmp_path: Path) -> None:
    prod = load_stack("prod")
    assert prod.tenants
    assert _env(prod)["VLLM_PLATFORM_TENANT_LOOP_SHARE"] == "0.25"
    paced = _stack(tmp_path, "prod", tenant_body_loop_share=0.5)
    assert _env(paced)["VLLM_PLATFORM_TENANT_LOOP_SHARE"] == "0.5"
    # Without tenants there is one key, so nothing to keep apart: no pacing.
    assert "VLLM_PLATFORM_TENANT_LOOP_SHARE" not in _env(load_stack("dev"))
