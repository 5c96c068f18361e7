"""Tenants in the config and in what the stack renders (issue 26): prod has two tenants; dev has none
and keeps one key per model. The middleware itself: tests/test_tenant_auth.py; the real server and
router: tests/e2e/test_tenants.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from components import secrets, server_auth
from domain.config import ConfigError, stack_file_for
from domain.config.tenants import tenant_warnings, tenants_on
from infra.aws.tenant_limits import RATE_LIMITED_BODY_KEY, WITHOUT_TENANT_KEY_RULE
from infra.stack_checks import load_stack
from tests.conftest import rendered
from tests.test_serving_render import config_of, container

WEB_ACL = "aws:wafv2/webAcl:WebAcl"


def _pod_specs(stack: str) -> dict[str, dict[str, Any]]:
    """Namespace -> pod spec of the vLLM workload (Deployment or canary Rollout)."""
    render = rendered(stack)
    workloads = [*render.find("Deployment"), *render.find("Rollout")]
    return {
        w["metadata"]["namespace"]: w["spec"]["template"]["spec"]
        for w in workloads
        if w["metadata"]["name"] == "vllm" and w["metadata"]["namespace"].startswith("vllm-")
    }


def test_prods_pods_accept_exactly_the_keys_of_the_tenants_allowed_on_their_model() -> None:
    render = rendered("prod")
    config = config_of(render)
    assert len(config.tenants) == 2
    pods = _pod_specs("prod")
    for model in config.models:
        spec = pods[model.namespace]
        server = container(spec)
        env = {e["name"]: e.get("value") for e in server["env"]}
        # No VLLM_API_KEY: it would switch on vLLM's own one-key check, which refuses every tenant key.
        assert "VLLM_API_KEY" not in env
        assert env["VLLM_PLATFORM_TENANTS"] == f"{server_auth.MOUNT_PATH}/{server_auth.TENANTS_FILE}"
        assert env["VLLM_PLATFORM_TENANT_MOUNT"] == secrets.TENANT_KEYS_MOUNT_PATH
        assert server_auth.FORCE_INCLUDE_USAGE in server["args"]
        assert secrets.tenant_keys_volume_mount() in server["volumeMounts"]
        volume = next(v for v in spec["volumes"] if v["name"] == secrets.TENANT_KEYS_VOLUME)
        assert volume["csi"]["volumeAttributes"]["secretProviderClass"] == secrets.TENANT_KEYS_PROVIDER_CLASS
        assert all(v["name"] != secrets.API_KEY_VOLUME for v in spec["volumes"])
        # The preloader never sees a key.
        assert all(m["name"] != secrets.TENANT_KEYS_VOLUME for m in spec["initContainers"][0]["volumeMounts"])

        [provider] = [
            p
            for p in render.find("SecretProviderClass", namespace=model.namespace)
            if p["metadata"]["name"] == secrets.TENANT_KEYS_PROVIDER_CLASS
        ]
        assert "secretObjects" not in provider["spec"]  # files only, no synced Secret
        objects = yaml.safe_load(provider["spec"]["parameters"]["objects"])
        files = {
            path["objectAlias"]: (o["objectName"], path["path"]) for o in objects for path in o["jmesPath"]
        }
        expected = {
            f"{tenant.name}.key{index}": (ref.name, ref.key)
            for tenant in tenants_on(config, model)
            for index, ref in enumerate(tenant.api_key_secrets)
        }
        assert files == expected and expected
        assert not render.find(
            "SecretProviderClass", name=secrets.API_KEY_PROVIDER_CLASS, namespace=model.namespace
        )

        [config_map] = render.find("ConfigMap", name=server_auth.CONFIG_MAP_NAME, namespace=model.namespace)
        document = json.loads(config_map["data"][server_auth.TENANTS_FILE])
        assert document["served_names"] == [model.openai_model_name]
        assert document["tenants"] == {
            t.name: {
                "models": [model.openai_model_name],
                "key_prefix": t.prefix,
                # Issues 34, 49: the tenant's per-pod share of max_concurrent_requests.
                "max_in_flight": (
                    None
                    if t.max_concurrent_requests is None
                    else server_auth.in_flight_share(t.max_concurrent_requests, model)
                ),
            }
            for t in tenants_on(config, model)
        }


def test_a_tenant_not_allowed_on_a_model_has_no_key_in_its_pods() -> None:
    config = load_stack("prod")
    by_name = {m.name: m for m in config.models}
    assert [t.name for t in tenants_on(config, by_name["llama-3-1-70b"])] == ["research"]
    assert [t.name for t in tenants_on(config, by_name["qwen2-5-7b-tp2"])] == ["search"]
    assert sorted(t.name for t in tenants_on(config, by_name["llama-3-1-8b"])) == ["research", "search"]


def test_stacks_without_tenants_keep_one_key_per_model() -> None:
    render = rendered("dev")
    config = config_of(render)
    assert not config.tenants
    for spec in _pod_specs("dev").values():
        env = {e["name"]: e for e in container(spec)["env"]}
        assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == secrets.API_KEY_SECRET_NAME
        assert "VLLM_PLATFORM_TENANTS" not in env
        assert server_auth.FORCE_INCLUDE_USAGE not in container(spec)["args"]
    for config_map in render.find("ConfigMap", name=server_auth.CONFIG_MAP_NAME):
        assert set(config_map["data"]) == {server_auth.MODULE_FILE.name}
    assert render.aws(WEB_ACL) == []


def test_the_waf_limits_each_tenants_keys_per_key_and_never_holds_a_key() -> None:
    render = rendered("prod")
    config = config_of(render)
    [acl] = render.aws(WEB_ACL)
    inputs = acl.inputs
    assert inputs["scope"] == "REGIONAL" and inputs["defaultAction"] == {"allow": {}}
    rules = {rule["name"]: rule for rule in inputs["rules"]}
    assert set(rules) == {f"tenant-{t.name}-rate" for t in config.tenants if t.requests_per_minute} | {
        WITHOUT_TENANT_KEY_RULE
    }
    for tenant in config.tenants:
        rule = rules[f"tenant-{tenant.name}-rate"]
        statement = rule["statement"]["rateBasedStatement"]
        assert statement["limit"] == tenant.requests_per_minute and statement["evaluationWindowSec"] == 60
        assert statement["aggregateKeyType"] == "CUSTOM_KEYS"
        assert [k["header"]["name"] for k in statement["customKeys"]] == ["authorization"]
        match = statement["scopeDownStatement"]["byteMatchStatement"]
        assert match["positionalConstraint"] == "STARTS_WITH"
        assert match["searchString"] == f"bearer {tenant.prefix}"
        assert [t["type"] for t in match["textTransformations"]] == ["COMPRESS_WHITE_SPACE", "LOWERCASE"]
        block = rule["action"]["block"]["customResponse"]
        assert block["responseCode"] == 429 and block["customResponseBodyKey"] == RATE_LIMITED_BODY_KEY
        # A sampled request shows its headers, the key among them.
        assert rule["visibilityConfig"]["sampledRequestsEnabled"] is False
    # Only non-secret prefixes and store *names* are in the ACL; no store reference at all.
    text = json.dumps(inputs)
    assert all(ref.name not in text for t in config.tenants for ref in t.api_key_secrets)
    body = json.loads(inputs["customResponseBodies"][0]["content"])
    assert body["error"]["code"] == "rate_limit_exceeded"


def test_the_waf_also_bounds_requests_without_a_tenants_key_per_client_address() -> None:
    """Issue 40: no key, another scheme or a key of no tenant is counted per client IP and answered
    429 past `ingress.requests_without_tenant_key_per_minute`; a tenant's key never counts here."""
    render = rendered("prod")
    config = config_of(render)
    [acl] = render.aws(WEB_ACL)
    (rule,) = [r for r in acl.inputs["rules"] if r["name"] == WITHOUT_TENANT_KEY_RULE]
    assert rule["priority"] == max(r["priority"] for r in acl.inputs["rules"])
    statement = rule["statement"]["rateBasedStatement"]
    assert statement["aggregateKeyType"] == "IP"
    assert statement["limit"] == config.ingress.requests_without_tenant_key_per_minute == 60
    negated = statement["scopeDownStatement"]["notStatement"]["statement"]["orStatement"]["statements"]
    assert [m["byteMatchStatement"]["searchString"] for m in negated] == [
        f"bearer {t.prefix}" for t in config.tenants
    ]
    assert all(
        [t["type"] for t in m["byteMatchStatement"]["textTransformations"]]
        == ["COMPRESS_WHITE_SPACE", "LOWERCASE"]
        for m in negated
    )
    assert rule["action"]["block"]["customResponse"]["responseCode"] == 429
    assert rule["visibilityConfig"]["sampledRequestsEnabled"] is False


def test_every_ingress_of_the_alb_names_the_tenants_web_acl() -> None:
    render = rendered("prod")
    [acl] = render.aws(WEB_ACL)
    ingresses = render.find("Ingress")
    # two models and the router's unified endpoint (the third model scales to zero: no own hostname)
    assert len(ingresses) == 3
    annotations = {
        i["metadata"]["annotations"].get("alb.ingress.kubernetes.io/wafv2-acl-arn") for i in ingresses
    }
    [arn] = annotations  # one ALB (one ingress group), one web ACL
    assert re.fullmatch(
        rf"arn:aws:wafv2:us-east-1:\d{{12}}:regional/webacl/{acl.inputs['name']}/[0-9a-f]+", arn
    )


def _stack_with(tmp_path: Path, edit: Any, base: str = "prod") -> Path:
    document = yaml.safe_load(stack_file_for(base).read_text())
    edit(document["config"])
    path = tmp_path / "Pulumi.variant.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_a_model_no_tenant_may_call_is_a_warning_not_an_error(tmp_path: Path) -> None:
    def only_search_on_qwen(values: dict[str, Any]) -> None:
        values["vllm-platform:tenants"] = [
            {**values["vllm-platform:tenants"][0], "models": ["Qwen/Qwen2.5-7B-Instruct"]}
        ]

    path = _stack_with(tmp_path, only_search_on_qwen)
    config = load_stack("variant", stack_file=path)
    assert [(w.path, w.value) for w in tenant_warnings(config)] == [
        (("models", 0), "meta-llama/Llama-3.1-8B-Instruct"),
        (("models", 1), "meta-llama/Llama-3.1-70B-Instruct"),
    ]
    validated = subprocess.run(
        [str(Path(sys.executable).parent / "vllm-platform"), "validate", "variant", "--file", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert validated.returncode == 0, validated.stderr
    assert "warning: vllm-platform:models[1]" in validated.stderr and "no tenant may call" in validated.stderr


@pytest.mark.parametrize(
    ("edit", "key_path", "fragment"),
    [
        (
            lambda t: t[0].update(api_key_secrets=[t[0]["api_key_secrets"][0]] * 2),
            ("tenants", 0, "api_key_secrets", 1),
            "the same key twice",
        ),
        (
            lambda t: t[1].update(key_prefix="tk-search_x_"),
            ("tenants", 1, "key_prefix"),
            "overlaps tenant 'search'",
        ),
        (
            lambda t: t[0].update(models=["meta-llama/Llama-3.1-8B-Instruct"] * 2),
            ("tenants", 0, "models", 1),
            "listed twice",
        ),
        (
            lambda t: t[0].update(requests_per_minute=5),
            ("tenants", 0, "requests_per_minute"),
            "greater than or equal to 10",
        ),
    ],
)
def test_tenant_mistakes_name_the_key_and_the_fix(
    tmp_path: Path, edit: Any, key_path: tuple, fragment: str
) -> None:
    def change(values: dict[str, Any]) -> None:
        edit(values["vllm-platform:tenants"])

    with pytest.raises(ConfigError) as raised:
        load_stack("variant", stack_file=_stack_with(tmp_path, change))
    assert [p.path for p in raised.value.problems] == [key_path]
    assert fragment in str(raised.value)


def test_a_per_model_key_beside_tenants_is_refused(tmp_path: Path) -> None:
    def add_model_key(values: dict[str, Any]) -> None:
        values["vllm-platform:models"][2]["api_key_secret"] = {"name": "vllm-platform/prod/qwen/api-key"}

    with pytest.raises(ConfigError) as raised:
        load_stack("variant", stack_file=_stack_with(tmp_path, add_model_key))
    assert [p.path for p in raised.value.problems] == [("models", 2, "api_key_secret")]


def test_a_rate_limit_needs_the_stacks_alb(tmp_path: Path) -> None:
    def nginx(values: dict[str, Any]) -> None:
        values["vllm-platform:ingress"]["class_name"] = "nginx"

    with pytest.raises(ConfigError) as raised:
        load_stack("variant", stack_file=_stack_with(tmp_path, nginx))
    assert ("tenants", 0, "requests_per_minute") in [p.path for p in raised.value.problems]
    assert "class_name 'alb'" in str(raised.value)


def test_vault_and_kubernetes_secret_stores_deliver_the_same_key_files() -> None:
    from domain.config.models import SecretRefConfig
    from domain.config.platform import SecretStoreConfig

    files = [
        secrets.SecretFile(SecretRefConfig(name="teams/search", key="current"), "search.key0"),
        secrets.SecretFile(SecretRefConfig(name="teams/search", key="next"), "search.key1"),
    ]
    vault = SecretStoreConfig(
        provider="vault", vault_address="https://vault.example.com:8200", vault_role="vllm"
    )
    spec = secrets.tenant_keys_provider_class_spec(vault, files, "us-east-1")
    assert spec["provider"] == "vault" and "secretObjects" not in spec
    assert yaml.safe_load(spec["parameters"]["objects"]) == [
        {"objectName": "search.key0", "secretPath": "teams/search", "secretKey": "current"},
        {"objectName": "search.key1", "secretPath": "teams/search", "secretKey": "next"},
    ]
    # Secrets Manager: one object per entry (the provider refuses an entry named twice).
    aws = secrets.tenant_keys_provider_class_spec(SecretStoreConfig(), files, "us-east-1")
    [entry] = yaml.safe_load(aws["parameters"]["objects"])
    assert [p["objectAlias"] for p in entry["jmesPath"]] == ["search.key0", "search.key1"]
    # An existing Secret per key, projected into one folder the kubelet also updates in place.
    volume = secrets.tenant_keys_volume(SecretStoreConfig(provider="kubernetes-secret"), files)
    assert [s["secret"]["items"] for s in volume["projected"]["sources"]] == [
        [{"key": "current", "path": "search.key0"}],
        [{"key": "next", "path": "search.key1"}],
    ]


def _aws_api(value: Any) -> Any:
    """pulumi_aws's inputs of a WebAcl in the WAFv2 API's own spelling (PascalCase members)."""
    spelled = {"cloudwatchMetricsEnabled": "CloudWatchMetricsEnabled"}
    if isinstance(value, dict):
        return {spelled.get(k, k[:1].upper() + k[1:]): _aws_api(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_aws_api(item) for item in value]
    return value


def _enum_problems(value: Any, shape: Any, path: str = "") -> list[str]:
    """Values outside the service model's enums (botocore's validator checks names, types and ranges,
    not enums)."""
    if shape.type_name == "structure":
        return [p for k, v in value.items() for p in _enum_problems(v, shape.members[k], f"{path}.{k}")]
    if shape.type_name == "list":
        return [p for i, v in enumerate(value) for p in _enum_problems(v, shape.member, f"{path}[{i}]")]
    if shape.type_name == "map":
        return [p for k, v in value.items() for p in _enum_problems(v, shape.value, f"{path}[{k}]")]
    if shape.type_name == "string" and shape.enum and value not in shape.enum:
        return [f"{path} = {value!r} is not one of {shape.enum}"]
    return []


def test_the_web_acl_is_a_valid_create_web_acl_request_for_the_wafv2_api() -> None:
    """botocore's WAFv2 service model (AWS's own API description) checks every member name, type,
    range (a limit of at least 10) and enum value (STARTS_WITH, CUSTOM_KEYS, COMPRESS_WHITE_SPACE)."""
    import botocore.session
    from botocore.validate import ParamValidator

    [acl] = rendered("prod").aws(WEB_ACL)
    inputs = dict(acl.inputs)
    bodies = inputs.pop("customResponseBodies")
    request = _aws_api({k: v for k, v in inputs.items() if k not in ("region", "tags", "tagsAll")})
    request["CustomResponseBodies"] = {
        body["key"]: {"ContentType": body["contentType"], "Content": body["content"]} for body in bodies
    }
    model = botocore.session.get_session().get_service_model("wafv2").operation_model("CreateWebACL")
    report = ParamValidator().validate(request, model.input_shape)
    assert not report.has_errors(), report.generate_report()
    assert _enum_problems(request, model.input_shape) == []
    match = request["Rules"][0]["Statement"]["RateBasedStatement"]["ScopeDownStatement"]["ByteMatchStatement"]
    assert _enum_problems(
        {**match, "PositionalConstraint": "BEGINS_WITH"}, model.service_model.shape_for("ByteMatchStatement")
    )
    # The check can fail: a limit below WAF's minimum is reported.
    request["Rules"][0]["Statement"]["RateBasedStatement"]["Limit"] = 5
    assert ParamValidator().validate(request, model.input_shape).has_errors()
